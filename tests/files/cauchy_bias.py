"""The README's bias of one's own, as a file for `python -m minidape train --import tests/files/cauchy_bias.py
--pe cauchy` (run from the repository root); tests/test_package.py checks that the README shows this file."""

import torch

import minidape as md


@md.register_pe("cauchy")
class CauchyBias(md.AdditiveBias):
    def __init__(self, cfg):
        super().__init__()
        self.width = torch.nn.Parameter(torch.full((cfg.n_head,), 8.0))

    def forward(self, q_pos, k_pos):
        d = (q_pos[:, None] - k_pos[None, :]).abs().float()  # (Tq, Tk)
        return -torch.log1p((d / self.width[:, None, None]) ** 2)  # (n_head, Tq, Tk)
