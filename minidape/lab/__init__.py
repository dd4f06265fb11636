"""The lab: what trains and measures models built from the core — the corpora (`data`), the one training loop
(`train`, with its checkpoints and DDP), the extrapolation protocols (`evaluate`), the figures (`plots`), the
Chomsky-hierarchy tasks and their training (`tasks`, `che`), and the benchmarks (`bench`).

It imports the core (`minidape.model`, `fast`, `kernels`) and the helpers (`utils`, `threads`), never the study or
the classroom. `md.train`, `md.evaluate`, `md.load_corpus`, `md.tasks`, `md.plots`, `md.che` reach it from the
package's top.
"""
