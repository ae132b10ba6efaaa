"""Collections: merged, deduplicated exports across datasets (issue 51).

A collection is a dataset whose ``config.yml`` names ``children``
(followthemoney's dataset model; OpenSanctions publishes ``default``,
``sanctions``… this way). Its statements are its leaves' live statements with
``canonical_id`` set by a nomenklatura resolver; entities the judgements say
are the same are one entity in its exports.

- :mod:`.leaves`: the children, nested collections resolved to their leaves;
- :mod:`.resolver`: clusters and canonical ids by nomenklatura's rules;
- :mod:`.judgements`: the judgements as a Delta table of the collection,
  loaded from nomenklatura's SQL table or JSON-lines dump, dumped back;
- :mod:`.build`: the Spark plan writing the collection's own tables;
- :mod:`.make`: build when a leaf or a judgement changed, then the exports
  and a published version (the dataset machinery, unchanged).

The layer sits over the exports and under the facade, the CLI and the
Dagster definitions; it reads its leaves' tables through the layers below.
"""
