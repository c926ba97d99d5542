"""``python -m tether ...``: the same CLI as the ``tether`` command."""

from tether.cli import app

app(prog_name="tether")
