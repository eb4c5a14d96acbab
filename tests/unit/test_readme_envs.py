"""The README's table of AIENG_* variables is generated from aieng/envs.py: they must not drift apart."""
import os

from aieng.envs import markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_table_matches_registry():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index("\n", text.index("<!-- envs:start")) + 1
    end = text.index("<!-- envs:end -->")
    assert text[start:end].strip() == markdown_table().strip(), "regenerate with: python -m aieng.envs"
