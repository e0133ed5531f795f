"""The torch-free runtime core: what serving, exporting, evaluating and clients all share.

    runtime.tokenizer   SentencePiece runtime (encode/decode, newline/tab mapping, placeholder patterns)
    runtime.bundle      the ONNX bundle's layout, manifest and integrity checks (sha256)
    runtime.decoding    decoding options, their defaults and their one validation; length rules
    runtime.splits      the corpus split files (data/{split}.en/.es): reading them back

Nothing here imports torch, onnx, grpc or any other package of the project: `server/`, `export/`,
`model/`, `bench/` and `client/` import from it, never the other way round.
"""
