"""What the grader asks of a module of a student's answer where the answer lives (the sandboxed worker, or a
notebook's own process): build it as ``md.train`` would, and its bias or gradients at given parameter values.
It imports only torch: a graded run's package copy holds it, and none of the checks."""

from __future__ import annotations

import torch


def built(your_class, cfg, state: torch.Tensor) -> tuple:
    """``your_class(cfg)`` built from the random state ``state``, as ``md.train`` builds a model after seeding:
    (the module, its parameters' values, whether each one trains, the random state its ``__init__`` left)."""
    torch.set_rng_state(state)
    module = your_class(cfg)
    parameters = list(module.parameters())
    values = [p.detach().clone() for p in parameters]
    return module, values, [p.requires_grad for p in parameters], torch.get_rng_state()


def bias_with(module, values, q_pos, k_pos, weights=None):
    """``module(q_pos, k_pos)`` with its parameters set to ``values``; given ``weights`` (the shape of that
    bias), the gradients of ``(module(q_pos, k_pos) * weights).sum()`` for each parameter instead (None where
    none reached it)."""
    with torch.no_grad():
        for parameter, value in zip(module.parameters(), values):
            parameter.copy_(value)
        if weights is None:
            return module(q_pos, k_pos).detach()
    module.zero_grad(set_to_none=True)
    with torch.enable_grad():  # also when asked from an autograd backward, which runs without
        (module(q_pos, k_pos) * weights).sum().backward()
    return [None if p.grad is None else p.grad.detach().clone() for p in module.parameters()]
