"""`linnet site build [--out DIR]`: the static site from the zoo and the records."""

from __future__ import annotations

import time

import click


@click.group()
def site() -> None:
    """The static site: zoo cards, runtime matrix, model pages, benchmarks, language."""


@site.command()
@click.option("--out", default=None, help="output folder (default site/_build)")
@click.option("--results", default=None, help="parity records (default results/parity)")
@click.option("--bench", default=None, help="benchmark results (default bench/results)")
@click.option("--language", default=None, help="the language reference (docs/language.md)")
def build(out, results, bench, language) -> None:
    """Generate the site; prints the path of its index page."""
    from linnet.site.build import Inputs, build_site

    t0 = time.perf_counter()
    index = build_site(out, Inputs.default(results, bench, language))
    click.echo(f"site built in {time.perf_counter() - t0:.1f} s", err=True)
    click.echo(str(index))
