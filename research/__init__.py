"""The study this repository runs with oelm, outside the library (``pip install oelm`` does not ship
it): the verdicts table of ``docs/results/README.md`` (:mod:`research.claims`, with the claims it
tests in :mod:`research.claims_list` and its benchmark and parameter rows in
:mod:`research.claims_rows`). It reads the repository's committed ``docs/results`` through oelm's
records and report; nothing in oelm imports it. Run it from the repository root::

    .venv/bin/python -m research.claims docs/results --update docs/results/README.md
"""
