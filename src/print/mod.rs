//! Printing: a room of its own, as media is. [`ipp`] speaks IPP (RFC
//! 8010/8011) to a printer over HTTP, with the `ipp` crate's encoding;
//! [`prepare`] makes the print-ready image (the picture fitted to a
//! page of the printer's media at its resolution). The print queue
//! (`crate::actors::print_queue`) uses both; nothing here touches the
//! database.

pub mod cost;
pub mod ipp;
pub mod prepare;
