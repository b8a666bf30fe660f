"""Leaf helpers every layer of flower may use (``core``, ``stores``, ``docs``, ``workflow``).

Nothing here imports anything of flower's except ``flower._errors``: owner-only files and
atomic replacement (:mod:`.fsutil`), the one-off Bash test shared by trimming and the
coordinator's guard (:mod:`.ephemeral`), and the "context overflowed" test shared by the
resilience policy and the handoff (:mod:`.overflow`).
"""
