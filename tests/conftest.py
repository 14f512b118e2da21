"""Suite-wide checks: every run summary a test leaves in its tmp_path validates against the shipped schema."""

from __future__ import annotations

import pytest

from summaries import check_tree


@pytest.fixture(autouse=True)
def _validate_summaries(request):
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is not None and tmp.is_dir():
        check_tree(tmp)
