"""The README's Gaussian decay of one's own (its `compare` section): -(d / w_h)^2 / 2, a learned width per head."""

import torch

import minidape as md


class GaussianDecay(md.AdditiveBias):
    def __init__(self, cfg):
        super().__init__()
        self.log_width = torch.nn.Parameter(torch.linspace(2.0, 4.2, cfg.n_head))  # widths 7 .. 67 tokens

    def forward(self, q_pos, k_pos):
        distance = (q_pos.view(-1, 1) - k_pos.view(1, -1)).clamp(min=0).float()  # (Tq, Tk), causal: d >= 0
        return -0.5 * (distance / self.log_width.exp()[:, None, None]) ** 2
