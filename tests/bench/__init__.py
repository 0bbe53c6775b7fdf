"""The benchmark registry (gla_ref.bench) and the scripts of benchmarks/ in their CPU smoke modes."""
