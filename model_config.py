"""Moved into results.py: `import model_config` gives that module itself (patches reach it too) until imports are renamed."""
import sys

import results

sys.modules[__name__] = results
