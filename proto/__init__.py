"""API definition (translator/v1/translator.proto) and its generated Python stubs (proto.gen).

Regenerate the stubs after editing the .proto: ``python -m proto.generate``.
"""
