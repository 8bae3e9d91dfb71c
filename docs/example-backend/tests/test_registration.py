"""The example registers the way every backend does: by name and by URL scheme."""

import subprocess
import sys
from importlib.metadata import distribution

from pai_example_kv import backend

from pai_storage.backend import ENTRY_POINT_GROUP, get_backend
from pai_storage.registry import SCHEME_ENTRY_POINT_GROUP


def test_entry_points_name_the_backend_and_each_of_its_schemes() -> None:
    eps = distribution("pai-example-kv").entry_points
    by_name = {ep.name: ep.value for ep in eps.select(group=ENTRY_POINT_GROUP)}
    by_scheme = {ep.name: ep.value for ep in eps.select(group=SCHEME_ENTRY_POINT_GROUP)}
    assert by_name == {"examplekv": "pai_example_kv:backend"}
    assert by_scheme == dict.fromkeys(backend.url_schemes, "pai_example_kv:backend")
    assert get_backend("examplekv") is backend


def test_opening_kv_imports_no_other_backend() -> None:
    code = (
        "import sys\n"
        "from pai_storage import open_store\n"
        "open_store('kv://')\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules if m.startswith('pai_')})))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    # pai_storage_conformance: the example imports its harness base (stdlib only) at the top.
    assert run.stdout.split() == ["pai_example_kv", "pai_storage", "pai_storage_conformance"]
