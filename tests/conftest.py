import os
import sys
from pathlib import Path

# tests import the shared contract suite as a plain module
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("PYTHONHASHSEED", "0")
