"""trainscale.sim"""
