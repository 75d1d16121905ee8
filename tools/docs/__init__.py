"""The documentation site's generators (``python -m tools.docs``)."""
