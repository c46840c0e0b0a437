import sys
from pathlib import Path

# bad_cases.py is shared with netns-tests/; make it importable from both.
sys.path.insert(0, str(Path(__file__).parent))
