"""A bias of one's own, as a file for `python -m minidape compare --pe tests/files/my_bias.py:MyBias`
(the README's example, run from the repository root) and for the tests of `compare`."""

import torch

import minidape as md


class MyBias(md.AdditiveBias):
    """-slope * distance with one learnable slope per head (ALiBi with learned slopes)."""

    def __init__(self, cfg):
        super().__init__()
        self.slope = torch.nn.Parameter(torch.full((cfg.n_head,), 0.1))

    def forward(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (Tq, Tk)
        return -self.slope[:, None, None] * distance  # (n_head, Tq, Tk)


class NotABias(torch.nn.Module):
    """A module that is not an md.AdditiveBias: `compare` refuses it."""
