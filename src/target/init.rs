//! `ticketflow target init`: writes a starter scenario set (in progress).
