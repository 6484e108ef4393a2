"""Versioned SQL migrations, shipped as package data so every image carries them.

``sql/<component>/V<nnn>__<name>.sql``; applied in order by
:mod:`shared.migrations`, each exactly once, each idempotent on its own.
"""
