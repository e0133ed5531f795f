"""Measurements of speed and quality: engine speed against PyTorch and CTranslate2, a decoder step's
cost, the batching ceiling at saturation, the batching modes through gRPC, translation quality.

Benchmarks may import everything (model/, export/, server/, client/, runtime/); nothing imports them
(tests of the benchmarks themselves aside).
"""
