"""cels.mechanism"""
