#pragma once
// A program that dies of a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) first writes which
// signal it was and its stack to stderr, then dies of the same signal (the same exit status, and
// a core file where the system keeps them). A crash on a machine one cannot reach — a lent GPU
// for a few minutes, a user's workstation — then says where it happened. Frames in our programs
// show as `program(+0xOFFSET)`: `addr2line -f -C -e PROGRAM 0xOFFSET` names them, given the same
// binary.

namespace tessera::core {

// Installs the report for the whole process (the faulting thread's stack is printed); `program`
// names it in the report and must outlive the process (a string literal). Call once, early in
// main().
void report_fatal_signals(const char* program);

}  // namespace tessera::core
