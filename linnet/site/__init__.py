"""The static site: zoo cards, the runtime matrix, one page per model, the benchmarks and the
language reference, generated from what the project records.

    from linnet.site.build import build_site
    index = build_site(out="site/_build")      # or `linnet site build [--out DIR]`

Modules: `records` (parity records, read and checked), `bench` (benchmark results as rows),
`matrix` (model x runtime cells, each derived from records), `charts` (inline SVG bars),
`highlight` (.linnet and TOML as HTML), `pages` (what each page shows), `build` (templates to
files). Nothing here imports torch or transformers, and nothing imports this package.
"""
