"""python/examples/quickstart.ipynb executed end to end by nbclient, on the
database `blobhouse demo` makes: connect, query, pandas, Polars, a plot."""

import os
import subprocess

import nbclient
import nbformat

from conftest import REPO, blobhouse_binary


def test_quickstart_notebook_runs(tmp_path):
    subprocess.run([str(blobhouse_binary()), "demo", "--sf", "0.01", "--dir", str(tmp_path), "--queries", "1"], check=True, capture_output=True)
    db = tmp_path / "sf0.01"
    assert (db / "blobhouse.json").exists()
    path = REPO / "python" / "examples" / "quickstart.ipynb"
    notebook = nbformat.read(path, as_version=4)
    os.environ["BLOBHOUSE_DEMO_DB"] = str(db)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if o.output_type == "execute_result" and "text/html" in o.get("data", {})]
    assert any("lineitem" in h for h in html), "SHOW TABLES did not render the tables"
    assert any(o.output_type == "display_data" and "image/png" in o.get("data", {}) for o in outputs), "no plot"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "1-URGENT" in text
