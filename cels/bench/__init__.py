"""cels.bench"""
