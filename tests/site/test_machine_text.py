"""The line the site shows for the machine a record was made on: the CPU's kernel flags
(bf16 and int8 dot products decide its speed) and a mark when other work ran beside it."""

from __future__ import annotations

from linnet.site.records import UNKNOWN, machine_text

EPYC = {
    "cpu": "AMD EPYC",
    "cpus": 2,
    "platform": "Linux",
    "cpu_flags": ["avx2", "avx512_bf16", "avx512_vnni", "avx512f", "fma", "sse4_2"],
}


def test_flags_that_decide_the_kernels_are_shown():
    text = machine_text(EPYC)
    assert text.startswith("AMD EPYC (avx2 avx512f avx512_bf16 avx512_vnni), 2 cores")
    assert "fma" not in text and "under load" not in text


def test_a_cpu_without_avx2_says_so():
    assert "(no AVX2)" in machine_text(dict(EPYC, cpu_flags=["sse4_2"]))


def test_figures_measured_under_load_are_marked():
    assert machine_text(dict(EPYC, under_load=True)).endswith(
        "measured under load (other work ran)"
    )


def test_older_records_without_flags_still_read():
    assert machine_text({"cpu": "Intel Xeon", "cpus": 4}) == "Intel Xeon, 4 cores"
    assert machine_text({}) == UNKNOWN
