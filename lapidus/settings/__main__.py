"""``python -m lapidus.settings``: print the generated settings reference, or with
``--write PATH`` rewrite the generated part of that file in place."""

import sys
from pathlib import Path

from .docs import render_markdown, update_doc

if __name__ == "__main__":  # pragma: no cover - a maintainer's tool
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        print("updated" if update_doc(Path(sys.argv[2])) else "unchanged")
    else:
        sys.stdout.write(render_markdown())
