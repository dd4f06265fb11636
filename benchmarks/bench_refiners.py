"""The refiner benchmark from a clone of the repository: `python benchmarks/bench_refiners.py [flags]` is
`python -m minidape bench [flags]`; the benchmark itself is `minidape/lab/bench.py`, its results RESULTS.md."""

import sys

from minidape.__main__ import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])  # the command line's parser: --help and a mistake answer before torch loads
