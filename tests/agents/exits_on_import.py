"""A plugin module that calls sys.exit while it is imported: registering it must fail cleanly."""

import sys

sys.exit("plugin module exited at import")
