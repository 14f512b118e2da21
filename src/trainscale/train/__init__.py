"""trainscale.train"""
