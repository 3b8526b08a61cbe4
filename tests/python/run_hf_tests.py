"""Runs test_capture_hf.py, or exits 77 (ctest's 'skipped') with a message when torch or
transformers is not installed. CI leaves them out (torch from PyPI is several GB); the device
script runs them, as does any machine with both installed."""
import importlib.util
import os
import sys

missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: the Hugging Face capture test needs {' and '.join(missing)} (pip install torch transformers)")
    sys.exit(77)
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_capture_hf.py")]))
