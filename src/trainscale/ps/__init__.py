"""trainscale.ps"""
