"""The skeletons ``attnspec new --family NAME FILE`` writes, one per array family: each conforms
as written (tests/test_templates.py judges them), and says where the author's kernel goes."""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).parent
