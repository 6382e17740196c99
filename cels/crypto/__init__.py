"""cels.crypto"""
