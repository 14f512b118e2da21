"""trainscale.lab"""
