//! A SIGKILLed harness leaves no child serving and its scratch databases are swept by the next run or `ticketflow clean`.
