"""The recorder put into env stacks: one :class:`~rlrec.record.engine.ClipEngine` per wrapper,
each on the shared :class:`~rlrec.record.wrappers.base.RecorderWrapper`.

- :mod:`~rlrec.record.wrappers.adapter`: :class:`Recorder`, a layer of rlrec's own env stack
  (between AutoReset and the adapter);
- :mod:`~rlrec.record.wrappers.gymnasium`: :class:`RecordVectorVideo`, a drop-in for Gymnasium's
  vector ``RecordVideo``;
- :mod:`~rlrec.record.wrappers.maniskill`: :class:`RecordClips`, where ManiSkill's
  ``RecordEpisode`` goes;
- :mod:`~rlrec.record.wrappers.genesis_forge`: :class:`VideoWrapper`, a drop-in for Genesis
  Forge's ``VideoWrapper``.

Each imports its framework: import the module you use (``rlrec.record`` names them lazily).
"""
