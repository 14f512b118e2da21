import pytest
from survive_jobs import JOB, run


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """One uninterrupted 2-process run of JOB: the weights every fault-injected run must reproduce."""
    d = tmp_path_factory.mktemp("reference")
    r = run(["train", "--nproc", "2", *JOB, "--checkpoint.dir", str(d)], timeout=180)
    assert r.rc == 0, r.text
    return d / "last.pt"
