package main

import "io"

// Placeholders until the operations commands land (being written now).
func cmdStatus(args []string, stdout, stderr io.Writer) error  { return errUsage }
func cmdFailed(args []string, stdout, stderr io.Writer) error  { return errUsage }
func cmdRequeue(args []string, stdout, stderr io.Writer) error { return errUsage }
func cmdReplay(args []string, stdout, stderr io.Writer) error  { return errUsage }
func cmdInbox(args []string, stdout, stderr io.Writer) error   { return errUsage }
