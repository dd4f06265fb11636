"""The shared test set-up of conftest.py does what it says: registrations end with the test that made them."""

import pytest
from conftest import registrations_restored
from torch import nn

import minidape as md
from minidape.lab.user_code import import_file


class Bias(md.AdditiveBias):
    def __init__(self, cfg):
        super().__init__()

    def forward(self, q_pos, k_pos):
        return (k_pos[None, :] - q_pos[:, None]).float().abs().neg().expand(2, -1, -1)  # (2, Tq, Tk)


class Refiner(nn.Module):
    def __init__(self, cfg):
        super().__init__()

    def forward(self, scores, bias, mask):
        return scores if bias is None else scores + bias


def test_registrations_and_imported_files_are_undone_when_the_block_ends(tmp_path):
    user_file = tmp_path / "users_bias.py"
    user_file.write_text(
        "import minidape as md\n\n\n@md.register_pe('from_a_file')\nclass FileBias(md.AdditiveBias):\n    pass\n"
    )
    pes, refiners = list(md.PE_NAMES), list(md.REFINER_NAMES)
    with registrations_restored():
        md.register_pe("probe")(Bias)
        md.register_refiner("probe")(Refiner)
        import_file(user_file)
        assert {"probe", "from_a_file"} <= set(md.PE_NAMES) and "probe" in md.REFINER_NAMES
    assert list(md.PE_NAMES) == pes and list(md.REFINER_NAMES) == refiners
    with registrations_restored():
        import_file(user_file)  # imported afresh: its registration is made again
        assert "from_a_file" in md.PE_NAMES
    assert list(md.PE_NAMES) == pes


@pytest.fixture(scope="module")
def module_bias():
    md.register_pe("module_probe")(Bias)
    return "module_probe"


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_may_register_the_same_name_and_keeps_what_a_module_fixture_registered(run, module_bias):
    assert module_bias in md.PE_NAMES  # the function-scoped undo keeps the module's registration
    assert "probe" not in md.PE_NAMES  # the first run's registration is undone
    md.register_pe("probe")(Bias)
    md.GPT(md.GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, pe="probe"))
