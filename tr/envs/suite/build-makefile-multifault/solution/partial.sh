#!/usr/bin/env bash

cd /app/calc && sed -i 's/\$(CFLAG) \$(CPPFLAG)/$(CFLAGS) $(CPPFLAGS)/; s/-o \$@ \$(OBJS)$/-o $@ $(OBJS) -lm/' Makefile && sed -i 's|^\t\$(CC) \$(CFLAGS) -o|\tmkdir -p bin\n\t$(CC) $(CFLAGS) -o|; s|^\t\$(CC) \$(CFLAGS) \$(CPPFLAGS) -c|\tmkdir -p obj\n\t$(CC) $(CFLAGS) $(CPPFLAGS) -c|' Makefile && make && bin/calc hyp 3 4
