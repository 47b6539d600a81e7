package main

import "io"

// Placeholders until the relay commands land (being written now).
func cmdRelay(args []string, stdout, stderr io.Writer) error   { return errUsage }
func cmdSweep(args []string, stdout, stderr io.Writer) error   { return errUsage }
func cmdJanitor(args []string, stdout, stderr io.Writer) error { return errUsage }
