"""cels.baselines"""
