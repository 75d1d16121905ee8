"""The operator console served by ``pgfleet api`` under /ui (see app.py).

Nothing is imported here: ``flags`` (standard library only) is read by every
``pgfleet`` command, and the rest needs the service extra (aiohttp).
"""
