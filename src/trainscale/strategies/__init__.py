"""trainscale.strategies"""
