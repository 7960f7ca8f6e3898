"""Small training sets the project builds itself (no download): instruction/answer pairs
from templates, preference pairs, and two-number multiplications with an exact answer.

    rows = instruction_pairs(64, seed=0)      # SFT rows: {"prompt": [...], "completion": [...]}
    rows = preference_pairs(64, seed=0)       # DPO rows: {"prompt", "chosen", "rejected"}
    rows = multiplication_prompts(64, seed=0) # GRPO rows: {"prompt", "answer"}
"""

from __future__ import annotations

import random
import re

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


# "Answer: 42" (the format TRL's and the seed's math rewards parse) or any number; digits
# may be grouped with commas ("1,234")
_ANSWER = re.compile(r"answer\s*(?:is)?\s*[:=]?\s*(-?\d[\d,]*)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*")


def final_answer(completion: str) -> str | None:
    """The number a completion ends on: the last "Answer: N" if it writes one, else its
    last number ("7 x 5 = 35" answers 35); None without a number."""
    found = _ANSWER.findall(completion) or _NUMBER.findall(completion)
    if not found:
        return None
    return found[-1].replace(",", "").rstrip(",")


def exact_answer_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer (`final_answer`) is `answer`, else 0.0."""
    return 1.0 if final_answer(completion) == str(answer) else 0.0
