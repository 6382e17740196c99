"""cels.protocol"""
