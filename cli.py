"""Moved into results.py: `import cli` gives that module itself (patches reach it too) until imports are renamed."""
import sys

import results

sys.modules[__name__] = results
