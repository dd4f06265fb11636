"""The refiner benchmark from a clone of the repository: `python benchmarks/bench_refiners.py [flags]` is
`python -m minidape bench [flags]`; the benchmark itself is `minidape/lab/bench.py`, its results RESULTS.md."""

from minidape.lab.bench import main

if __name__ == "__main__":
    main()
