"""``python -m kvsim``: the ``kvsim`` command, for a checkout or a machine without the
installed script (the lent GPU machine runs it this way)."""

from kvsim.entry import main

main()
