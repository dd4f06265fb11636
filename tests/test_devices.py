"""Package functions that take a model and tensors move the tensors to the model's device themselves.

Without a GPU: the probe's parameters live on PyTorch's "meta" device, and its forward records the device
its inputs arrived on, then stops the call. A function that forgot to move its tensors hands it CPU tensors.
"""

import sys

import pytest
import torch
from torch import nn

import minidape as md


class ReachedModel(Exception):
    """Raised by the probe's forward with the devices of what it received."""


class DeviceProbe(nn.Module):
    def __init__(self, cfg: md.GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(1, device="meta"))

    def forward(self, idx, targets=None):
        raise ReachedModel(idx.device, None if targets is None else targets.device)


def devices_received(call) -> tuple:
    with pytest.raises(ReachedModel) as reached:
        call()
    return reached.value.args


TOKENS = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("protocol", md.evaluate.PROTOCOLS)
def test_perplexity_by_length_feeds_the_model_on_its_device(protocol):
    probe = DeviceProbe(md.GPTConfig(block_size=16))
    idx_device, _ = devices_received(lambda: md.evaluate.perplexity_by_length(probe, TOKENS, [16], protocol=protocol))
    assert idx_device.type == "meta"


def test_loss_by_position_feeds_the_model_on_its_device():
    probe = DeviceProbe(md.GPTConfig(block_size=16))
    idx_device, _ = devices_received(lambda: md.evaluate.loss_by_position(probe, TOKENS, 16))
    assert idx_device.type == "meta"


def test_validation_loss_feeds_the_model_on_the_training_device():
    probe = DeviceProbe(md.GPTConfig(block_size=16))
    windows = md.data.fixed_windows(TOKENS, 17, 4)
    validation_loss = sys.modules["minidape.lab.train"].validation_loss
    received = devices_received(lambda: validation_loss(probe, windows, 2, md.utils.model_device(probe)))
    assert received == (torch.device("meta"), torch.device("meta"))


def test_che_evaluation_feeds_the_encoder_on_its_device():
    probe = DeviceProbe(md.che.task_config("reverse_string", md.GPTConfig()))
    idx_device, _ = devices_received(lambda: md.che.evaluate_task(probe, "reverse_string", [5], samples=2))
    assert idx_device.type == "meta"
