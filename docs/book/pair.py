"""Give every notebook the Colab cell and pair it with jupytext (`make pair`).

For each notebooks/NN_topic.py: its first cell becomes ``colab_cell.py`` (inserted after the jupytext header, or
replacing an earlier version of it), then ``jupytext --set-formats ipynb,py:percent`` writes the pairing into
the `.py` header and into the executed `.ipynb` beside it, whose cells it updates from the `.py` keeping every
output (the Colab cell, new to it, has none until `make notebooks` runs it). Running it again changes nothing.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE.parents[1] / "notebooks"
CELL = (HERE / "colab_cell.py").read_text()
HEADER_END = "# ---\n\n"  # the end of jupytext's YAML header, and the blank line before the first cell


def with_colab_cell(text: str, name: str) -> str:
    """The percent-format notebook ``text`` with ``CELL`` as its first cell."""
    if not text.startswith("# ---\n") or HEADER_END not in text:
        raise ValueError(f"{name}: no jupytext header (# --- ... # ---) followed by a blank line")
    header, body = text.split(HEADER_END, 1)
    if body.startswith(CELL.split("\n", 1)[0]):  # an earlier Colab cell: up to the next cell
        following = body.find("\n# %%", len("# %%"))
        body = body[following + 1 :] if following >= 0 else ""
    return f"{header}{HEADER_END}{CELL}\n{body}"


def main(folder: Path = NOTEBOOKS) -> int:
    from jupytext.cli import jupytext  # its command line, in this process

    for source in sorted(folder.glob("[0-9][0-9]_*.py")):
        text = source.read_text()
        updated = with_colab_cell(text, source.name)
        if updated != text:
            source.write_text(updated)
        jupytext(["--quiet", "--set-formats", "ipynb,py:percent", str(source)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
