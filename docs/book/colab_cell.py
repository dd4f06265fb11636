# %% tags=["colab"]
# On Colab, or in any Python without minidape, this cell installs it; elsewhere it does nothing. The torch already
# installed (Colab's CUDA build) is kept. QUICK_MODE = True, set before you run the notebook, runs it in quick
# mode: fewer training steps and shorter lengths, the same code.
QUICK_MODE = False
MINIDAPE_SOURCE = "minidape"  # what pip installs: minidape from the package index, or its wheel's URL or path

import importlib.metadata, importlib.util, os, subprocess, sys  # noqa: E401

if QUICK_MODE:
    os.environ["MINIDAPE_QUICK"] = "1"
if importlib.util.find_spec("minidape") is None:
    keep_torch = [f"torch=={importlib.metadata.version('torch')}"] if importlib.util.find_spec("torch") else []
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", MINIDAPE_SOURCE, *keep_torch])
    if pip.returncode != 0:
        raise RuntimeError(f"pip could not install minidape from {MINIDAPE_SOURCE!r}: set MINIDAPE_SOURCE to its wheel")
    importlib.invalidate_caches()
