// The program's version: the one place it is defined.
#pragma once
#define DC_VERSION "0.3.0"
