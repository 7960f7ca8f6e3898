"""Small training sets the project builds itself (no download): instruction/answer pairs
from templates, preference pairs, and two-number multiplications with an exact answer.

    rows = instruction_pairs(64, seed=0)      # SFT rows: {"prompt": [...], "completion": [...]}
    rows = preference_pairs(64, seed=0)       # DPO rows: {"prompt", "chosen", "rejected"}
    rows = multiplication_prompts(64, seed=0) # GRPO rows: {"prompt", "answer"}
"""

from __future__ import annotations

import random

COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
THINGS = ["apple", "car", "house", "bird", "river", "book", "chair", "cloud"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

TEMPLATES = [
    ("What is the plural of {thing}?", "The plural of {thing} is {thing}s."),
    ("Spell the number {n} in words.", "{n} is written {word}."),
    ("Name the color of a {color} {thing}.", "It is {color}."),
    ("Repeat the word {thing} twice.", "{thing} {thing}"),
    ("What number comes after {n}?", "After {n} comes {next}."),
]


def _fields(rng: random.Random) -> dict:
    n = rng.randrange(9)
    return {
        "thing": rng.choice(THINGS),
        "color": rng.choice(COLORS),
        "n": n,
        "word": NUMBERS[n],
        "next": n + 1,
    }


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def instruction_pairs(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, answer = rng.choice(TEMPLATES)
        values = _fields(rng)
        rows.append(
            {
                "prompt": _user(question.format(**values)),
                "completion": _assistant(answer.format(**values)),
            }
        )
    return rows


def preference_pairs(count: int, seed: int = 0) -> list[dict]:
    """The templates' right answer chosen over an answer from another template's fields."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, answer = rng.choice(TEMPLATES)
        values, other = _fields(rng), _fields(rng)
        wrong = answer.format(**other)
        if wrong == answer.format(**values):
            wrong = "I do not know."
        rows.append(
            {
                "prompt": _user(question.format(**values)),
                "chosen": _assistant(answer.format(**values)),
                "rejected": _assistant(wrong),
            }
        )
    return rows


def multiplication_prompts(count: int, seed: int = 0, digits: int = 2) -> list[dict]:
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    rows = []
    for _ in range(count):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        text = f"What is {a} times {b}? Answer with the number only."
        rows.append({"prompt": _user(text), "answer": str(a * b)})
    return rows


def exact_answer_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's first number is the answer, else 0.0."""
    words = [w.strip(".,!") for w in completion.split()]
    numbers = [w for w in words if w.isdigit()]
    return 1.0 if numbers and numbers[0] == answer else 0.0
