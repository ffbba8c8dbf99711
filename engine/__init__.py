"""The drift-matrix engine: does a model's own output survive, token for token, into its next prompt?

A plain library (no UI imports); `python -m engine` is its command-line face.
"""

import os

# transformers warns at import that PyTorch is absent; only its chat-template helpers are used here.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
